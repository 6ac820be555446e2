"""Logging filters named in settings.LOGGING."""

import logging

# Client errors that stay WARNINGs: a refusal (permission, CSRF) and a throttled client are worth an
# operator's eye; the rest of 4xx (a bad form, a missing page, a conflict) are the client's own doing.
WARN_STATUSES = frozenset({403, 429})


class ClientErrorsWithoutTraceback(logging.Filter):
    """django.request logs a 4xx at WARNING with the traceback of the exception that produced it: a page
    of log for what is the client's doing. Keep the one line, at INFO (every 400 and 404 a WARNING line
    buried the ones that matter) except WARN_STATUSES; 5xx keep their level and traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        status = getattr(record, "status_code", None)
        if isinstance(status, int) and 400 <= status < 500:
            record.exc_info = None
            record.exc_text = None
            if status not in WARN_STATUSES and record.levelno > logging.INFO:
                record.levelno, record.levelname = logging.INFO, logging.getLevelName(logging.INFO)
        return True
