import gc
import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
application = get_wsgi_application()

# Load the views (URL conf) now, then move everything loaded so far out of the garbage collector's
# sight: modules, models, views and settings live as long as the process, and a full collection that
# walks them all cost 70-90 ms in the middle of a page view (bench 5's slowest view at 100k jobs).
from django.urls import get_resolver  # noqa: E402

get_resolver().url_patterns  # noqa: B018 (imports every view)
gc.freeze()
