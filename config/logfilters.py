"""Logging filters named in settings.LOGGING."""

import logging


class ClientErrorsWithoutTraceback(logging.Filter):
    """django.request logs a 403 or 404 with the traceback of the exception that produced it: a page
    of log for what is the client's doing. Keep the one line; 5xx keep their traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        status = getattr(record, "status_code", None)
        if isinstance(status, int) and 400 <= status < 500:
            record.exc_info = None
            record.exc_text = None
        return True
