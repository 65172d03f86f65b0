"""The Redis slot leases' keys and the Lua scripts behind them (redis_registry.py has the theory
of operation).

Each script runs atomically in Redis. KEYS[1] is a backend's lease set, KEYS[2] (where used) the
epoch key. Times are milliseconds of Redis's own clock (`TIME`), so the replicas' clocks never matter.
"""

PREFIX = "hlf"
EPOCH_KEY = f"{PREFIX}:epoch"
FREE_PATTERN = f"{PREFIX}:free:*"


def leases_key(backend: str) -> str:
    """A backend's lease set: one member `<replica>:<request id>` per held slot."""
    return f"{PREFIX}:slots:{backend}"


def free_channel(backend: str) -> str:
    """Where a backend's given-back slots are announced (pub/sub)."""
    return f"{PREFIX}:free:{backend}"


def replica_of(member: str) -> str:
    return member.rsplit(":", 1)[0]


# The epoch key holds "<grace end> <epoch start>" (ms); `holder` is 1 when the calling replica
# holds slots, `discovery` the short grace for one that holds none (see the docstring).
_CLOCK = """
local function clock()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function grace_left(now, lease, holder, discovery)
  local g = redis.call('GET', KEYS[2])
  if not g then
    local grace = discovery
    if holder == 1 then grace = lease end
    redis.call('SET', KEYS[2], string.format('%d %d', now + grace, now))
    return grace
  end
  local left = tonumber(string.match(g, '^(-?%d+)')) - now
  if left > 0 then return left end
  return 0
end
-- a lost lease re-registered during the grace: the grace lasts lease_s from the epoch's start
local function full_grace(now, lease)
  local g = redis.call('GET', KEYS[2])
  local born = g and tonumber(string.match(g, ' (%d+)$'))
  if born and born + lease > now then
    redis.call('SET', KEYS[2], string.format('%d %d', born + lease, born))
    return born + lease - now
  end
  return 0
end
"""

# ARGV: lease_ms, limit, member, holder, discovery_ms -> {taken 0/1, slots in use, grace ms left}
# Idempotent (a member already in the set is simply held), so a call retried after a dropped
# connection cannot take two slots or mistake its own slot for somebody else's.
ACQUIRE = _CLOCK + """
local now = clock()
local lease = tonumber(ARGV[1])
local grace = grace_left(now, lease, tonumber(ARGV[4]), tonumber(ARGV[5]))
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local n = redis.call('ZCARD', KEYS[1])
if redis.call('ZSCORE', KEYS[1], ARGV[3]) then
  redis.call('ZADD', KEYS[1], now + lease, ARGV[3])
  return {1, n, 0}
end
if grace > 0 then return {0, n, grace} end
if n < tonumber(ARGV[2]) then
  redis.call('ZADD', KEYS[1], now + lease, ARGV[3])
  return {1, n + 1, 0}
end
return {0, n, 0}
"""

# ARGV: channel, member... -> how many were given back. The message carries the count left in
# use, so every replica's view of the backend's load is fresh without asking.
RELEASE = """
local freed = 0
for i = 2, #ARGV do freed = freed + redis.call('ZREM', KEYS[1], ARGV[i]) end
if freed > 0 then redis.call('PUBLISH', ARGV[1], redis.call('ZCARD', KEYS[1])) end
return freed
"""

# ARGV: lease_ms, limit, channel, holder, discovery_ms, n_drop, drop..., renew...
# -> {grace ms left, lost members, re-added members, every live member}
# A member still in the set is extended. A missing one (Redis lost it, or it expired) is added
# back during an epoch's grace (every holder is re-registering then), or when there is room; when
# there is none it is lost and its request must stop.
RENEW = _CLOCK + """
local now = clock()
local lease = tonumber(ARGV[1])
local limit = tonumber(ARGV[2])
local grace = grace_left(now, lease, tonumber(ARGV[4]), tonumber(ARGV[5]))
local ndrop = tonumber(ARGV[6])
local freed = 0
for i = 7, 6 + ndrop do freed = freed + redis.call('ZREM', KEYS[1], ARGV[i]) end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local lost, readded = {}, {}
for i = 7 + ndrop, #ARGV do
  local m = ARGV[i]
  if redis.call('ZSCORE', KEYS[1], m) then
    redis.call('ZADD', KEYS[1], now + lease, m)
  elseif grace > 0 or redis.call('ZCARD', KEYS[1]) < limit then
    redis.call('ZADD', KEYS[1], now + lease, m)
    readded[#readded + 1] = m
  else
    lost[#lost + 1] = m
  end
end
if grace > 0 and #readded > 0 then grace = full_grace(now, lease) end
if freed > 0 then redis.call('PUBLISH', ARGV[3], redis.call('ZCARD', KEYS[1])) end
return {grace, lost, readded, redis.call('ZRANGE', KEYS[1], 0, -1)}
"""

# -> {now ms, {member, expiry ms, ...}} of the live leases, read-only (for the admin view)
VIEW = _CLOCK + """
local now = clock()
return {now, redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. string.format('%d', now), '+inf', 'WITHSCORES')}
"""
