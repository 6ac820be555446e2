"""What runs on a GPU host: inventory (NVML or fake), the process runner, heartbeats, and the Celery
tasks of the host's own queue `node.<name>`. It never touches the database: everything it needs to
start an attempt travels in the message, and everything it learns goes back as control-side tasks."""

AGENT_VERSION = "0.1.0"
