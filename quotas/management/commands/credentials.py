"""Print how to sign in: the users and passwords kept in var/credentials.txt (`make run` runs this last,
just before the processes start)."""

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from quotas.credentials import credentials_path, read_credentials


class Command(BaseCommand):
    help = "Print the sign-in users and passwords kept in var/credentials.txt."

    def add_arguments(self, parser):
        parser.add_argument("--url", default="http://127.0.0.1:8000/login/")

    def handle(self, *args, url, **options):
        rows = read_credentials()
        path = credentials_path()
        if not rows:
            self.stdout.write(
                f"No {path}: set a password with `python manage.py changepassword admin` "
                "(or `createsuperuser`)."
            )
            return
        users = {u.username: u for u in get_user_model().objects.filter(username__in=[r[0] for r in rows])}
        width = max(len(r[0]) for r in rows)
        lines = [f"Sign in at {url} as (kept in {path}, mode 0600):"]
        for username, password, what in sorted(rows, key=lambda r: r[2] != "admin"):
            user = users.get(username)
            if user is None:
                note = "  (no such user any more)"
            elif not user.check_password(password):
                note = "  (password changed since)"
            else:
                note = ""
            lines.append(f"  {username.ljust(width)}  {password}  {what}{note}")
        lines.append("Forgot a changed one? python manage.py changepassword USER")
        self.stdout.write(self.style.SUCCESS("\n".join(lines)))
