"""The submit throttle: submits per user, counted in Redis in one round trip (the quick submit path,
jobs.api.fast_submit, counts with the same script and marks the request COUNTED so the DRF view does
not count it again)."""

import logging

from rest_framework.throttling import UserRateThrottle

log = logging.getLogger(__name__)

COUNTED = "_gpuquota_submit_counted"  # set on a request whose submit the throttle has counted


# DRF's sliding-window log (SimpleRateThrottle: newest first, entries older than the window dropped from
# the end, refused at `limit`), done inside Redis in one round trip and atomically, instead of a GET and
# a SET of the pickled list. Returns {1} when the request is counted, {0, n, oldest} when refused.
_THROTTLE_LUA = """
local key, now, duration, limit = KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local oldest = redis.call('LINDEX', key, -1)
while oldest and tonumber(oldest) <= now - duration do
  redis.call('RPOP', key)
  oldest = redis.call('LINDEX', key, -1)
end
local n = redis.call('LLEN', key)
if n >= limit then
  return {0, n, oldest}
end
redis.call('LPUSH', key, ARGV[1])
redis.call('EXPIRE', key, math.ceil(duration))
"""
THROTTLE_SCRIPT = _THROTTLE_LUA + "return {1}\n"
# The quick submit path's one round trip: the throttle as above (when ARGV[4] is '1'), then the values
# of KEYS[2..] (the submit cache's keys), '' for a missing one (a nil would cut Redis's reply short).
COUNT_AND_READ_SCRIPT = f"""
if ARGV[4] == '1' then
{_THROTTLE_LUA}
end
local out = {{1}}
for i = 2, #KEYS do
  out[i] = redis.call('GET', KEYS[i]) or ''
end
return out
"""
_throttle_script = None
_count_and_read_script = None


class SubmitThrottle(UserRateThrottle):
    """Submits per user (REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]["submit"]); a 429 carries Retry-After.
    The counts live in the cache (Redis): while it is down, submits are let through rather than
    answered 500, since a submit needs only the database (the beat asks for the pass). On Redis the log
    is a Redis list kept by THROTTLE_SCRIPT (one round trip); on other caches it is DRF's own."""

    scope = "submit"
    refused: tuple[int, float | None] | None = None  # (requests in the window, the oldest's time)

    def allow_request(self, request, view):
        if getattr(request, COUNTED, False):
            return True  # counted already by the quick way (jobs.api.fast_submit), which passed it on
        try:
            from django.core.cache.backends.redis import RedisCache

            if self.rate is None or not isinstance(self._backend(), RedisCache):
                return super().allow_request(request, view)
            return self._allow_in_redis(request, view)
        except Exception:
            log.warning(
                "submit throttle: the cache is unavailable; letting the submit through", exc_info=True
            )
            return True

    def _backend(self):
        """The cache itself (DRF's `cache` is django.core.cache.cache, a proxy to the default one)."""
        from django.utils.connection import ConnectionProxy

        cache = self.cache
        return cache._connections[cache._alias] if isinstance(cache, ConnectionProxy) else cache

    def _allow_in_redis(self, request, view) -> bool:
        global _throttle_script
        self.key = self.get_cache_key(request, view)
        if self.key is None:
            return True
        cache = self._backend()
        key = cache.make_and_validate_key(self.key) + ":log"
        client = cache._cache.get_client(key, write=True)
        if _throttle_script is None:
            _throttle_script = client.register_script(THROTTLE_SCRIPT)
        self.now = self.timer()
        got = _throttle_script(
            keys=[key], args=[repr(self.now), self.duration, self.num_requests], client=client
        )
        return self._counted(got)

    def _counted(self, got) -> bool:
        if got[0]:
            return True
        self.refused = (int(got[1]), float(got[2]) if len(got) > 2 else None)
        return False

    def count_and_read(self, request, keys: list[str]) -> tuple[bool, list[bytes | None]] | None:
        """Count this submit and read the cache's `keys`, in one round trip (COUNT_AND_READ_SCRIPT):
        (allowed, the raw values, None for a missing one; no values when refused). None when the
        cache is not Redis: ask allow_request and the cache separately then. Raises when Redis does."""
        global _count_and_read_script
        from django.core.cache.backends.redis import RedisCache

        cache = self._backend()
        if not isinstance(cache, RedisCache):
            return None
        self.key = self.get_cache_key(request, None) if self.rate is not None else None
        log_key = cache.make_and_validate_key(self.key) + ":log" if self.key is not None else ""
        client = cache._cache.get_client(None, write=True)
        if _count_and_read_script is None:
            _count_and_read_script = client.register_script(COUNT_AND_READ_SCRIPT)
        self.now = self.timer()
        got = _count_and_read_script(
            keys=[log_key, *(cache.make_and_validate_key(k) for k in keys)],
            args=[repr(self.now), self.duration or 0, self.num_requests or 0, "1" if self.key else "0"],
            client=client,
        )
        if not self._counted(got):
            return False, []
        return True, [value or None for value in got[1:]]

    def wait(self):
        if self.refused is None:
            return super().wait()
        count, oldest = self.refused
        remaining = self.duration - (self.now - oldest) if count and oldest is not None else self.duration
        available = self.num_requests - count + 1
        return None if available <= 0 else remaining / float(available)
