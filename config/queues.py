"""The broker's queue names, apart from the Celery app (config.celery) so that the Redis transport
(config.redisbroker) can name them without importing the app."""

CONTROL_QUEUE = "control"
INTAKE_PREFIX = "control.from."


def node_queue(node_name: str) -> str:
    return f"node.{node_name}"


def intake_queue(node_name: str) -> str:
    """Where node `node_name` pushes what it sends the control side on Redis: a list of its own, which
    the control worker moves onto `control` a few messages per node at a time (config.redisbroker.Intake):
    a flood from one node waits in its own list, never in front of other nodes' heartbeats."""
    return f"{INTAKE_PREFIX}{node_name}"
