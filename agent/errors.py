"""The one exception type the command line turns into `ibex-agent: <message>` and exit 1."""


class AgentError(Exception):
    """An expected failure, with a one-line message a person can act on."""
