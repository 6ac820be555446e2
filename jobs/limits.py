"""Limits on what a submit may ask for, shared by every interface (the dashboard's form and the API's
serializer import them), so that a value one refuses the other refuses too, with a field error."""

# The largest integer every supported database stores in an integer column (PostgreSQL `integer`); a
# larger one overflowed SQLite's INTEGER and answered a 500.
MAX_INT = 2**31 - 1
