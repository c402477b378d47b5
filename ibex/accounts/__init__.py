"""Accounts: organisations, memberships, provider profiles and API keys, with their
authentication, permissions and API. It imports only the rest of the `ibex` package; every app
may import it."""
