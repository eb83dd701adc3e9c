"""Per-key limits on requests and tokens per minute, with the `limits` library.

Fixed one-minute windows per key id. Storage is a `limits` storage URI: `memory://` (this gateway's
process) or `redis://HOST:PORT` (shared by several gateways; needs `pip install 'limits[async-redis]'`).
A request over its key's requests/minute, or arriving once the key's tokens/minute are spent, is
refused with 429 and Retry-After (seconds to the window's end). Tokens are counted as they are known:
the prompt when the request is admitted, the completion when it ends (so a long answer may overshoot
the minute's budget once; the next request then waits).
"""

from __future__ import annotations

import math
import time

from .api_keys import Key
from .errors import ApiError


def async_uri(uri: str) -> str:
    return uri if uri.startswith("async+") else f"async+{uri}"


class RateLimits:
    def __init__(self, storage_uri: str, requests_per_minute: int | None, tokens_per_minute: int | None):
        from limits.aio.strategies import FixedWindowRateLimiter
        from limits.storage import storage_from_string

        self.uri = storage_uri
        self.limiter = FixedWindowRateLimiter(storage_from_string(async_uri(storage_uri)))
        self.rpm, self.tpm = requests_per_minute, tokens_per_minute

    @staticmethod
    def _item(amount: int):
        from limits import RateLimitItemPerMinute

        return RateLimitItemPerMinute(amount)

    def limits_of(self, key: Key | None) -> tuple[int | None, int | None]:
        rpm = key.requests_per_minute if key and key.requests_per_minute else self.rpm
        tpm = key.tokens_per_minute if key and key.tokens_per_minute else self.tpm
        return rpm, tpm

    async def _refuse(self, item, key_id: str, what: str, limit: int) -> ApiError:
        stats = await self.limiter.get_window_stats(item, "t" if what == "tokens" else "r", key_id)
        wait = max(1, math.ceil(stats.reset_time - time.time()))
        return ApiError(
            429,
            f"Rate limit reached for key {key_id}: {limit} {what} per minute - retry in {wait} s, "
            "or ask for a higher limit ('lpx keys add --rpm/--tpm')",
            code="rate_limit_exceeded",
            type=what,
            headers={"Retry-After": str(wait)},
        )

    async def admit(self, key: Key | None, key_id: str) -> None:
        """Count one request; 429 if the key is over its requests or spent its tokens this minute."""
        rpm, tpm = self.limits_of(key)
        if rpm:
            item = self._item(rpm)
            if not await self.limiter.hit(item, "r", key_id):
                raise await self._refuse(item, key_id, "requests", rpm)
        if tpm:
            item = self._item(tpm)
            if not await self.limiter.test(item, "t", key_id):
                raise await self._refuse(item, key_id, "tokens", tpm)

    async def spend(self, key: Key | None, key_id: str, tokens: int) -> None:
        """Count tokens against the key's minute (always recorded, even past the limit)."""
        _, tpm = self.limits_of(key)
        if tpm and tokens > 0:
            await self.limiter.hit(self._item(tpm), "t", key_id, cost=tokens)
