"""Ray execution pool with a cluster-wide limiter (verl's `init_execution_pool`, fixed).

    pool = init_execution_pool(num_workers=10, rate_limit=10)
    result = await pool.execute.remote(fn, *args)

See docs/pool.md.  Needs Ray (`pip install verl-sf[ray]`).
"""

from verl_sf.pool.client import LimiterClient, shutdown_global_limiter
from verl_sf.pool.limiter import DEFAULT_LEASE_TTL_S, DEFAULT_LIMITER_NAME, LeaseExpired, TokenBucketWorker
from verl_sf.pool.process_runner import ExecutionCrashed
from verl_sf.pool.worker import ExecutionExited, ExecutionWorker, PoolMode, init_execution_pool

__all__ = [
    "DEFAULT_LEASE_TTL_S",
    "DEFAULT_LIMITER_NAME",
    "ExecutionCrashed",
    "ExecutionExited",
    "ExecutionWorker",
    "LeaseExpired",
    "LimiterClient",
    "PoolMode",
    "TokenBucketWorker",
    "init_execution_pool",
    "shutdown_global_limiter",
]
