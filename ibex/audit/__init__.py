"""The audit log: `record_audit` writes one entry per action a person or worker takes, inside
that action's transaction, with the request it came from. It imports only the rest of the `ibex`
package; every app may import it."""
