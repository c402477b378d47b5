"""The transactional outbox: tasks recorded in the same transaction as the change that needs
them and relayed to the broker after commit, so none is lost while Redis is down. It imports
only the rest of the `ibex` package; every app may import it."""
