"""What every app's REST API shares: the JSON error shape and its refusal maps, cursor
pagination, filters, throttles, renderers and the schema hooks. It imports only the rest of the
`ibex` package; every app may import it."""
