-- Admits one request of a tenant, atomically, with the local limiter's semantics
-- (gateway/src/quota/local.rs), in this order: request rate, tokens per minute, concurrency.
-- KEYS[1] rate: the GCRA's theoretical arrival time, microseconds.
-- KEYS[2] tokens: when the tokens bucket is full again, microseconds (GCRA over tokens).
-- KEYS[3] leases: sorted set of concurrency leases scored by their expiry, microseconds.
-- ARGV[1] period_us: 1 / requests_per_s.      ARGV[2] tau_us: period_us * (burst - 1).
-- ARGV[3] window_us: 60 s, the time an empty tokens bucket takes to fill.
-- ARGV[4] lease id.   ARGV[5] lease ttl_us.   ARGV[6] max_concurrent.
-- ARGV[7] now_us, or '' for the server's clock (tests pass their own).
-- Returns {1, 'admitted', 0} (the lease is held), or {0, reason, wait_us}.
local now
if ARGV[7] ~= '' then
  now = tonumber(ARGV[7])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local function store(key, value, ttl_us)
  redis.call('SET', key, string.format('%.17g', value), 'PX', math.floor(ttl_us / 1000) + 1000)
end

-- Request rate: governor's GCRA. Allowed when now >= tat - tau; then tat = max(tat, now) + T.
local period, tau = tonumber(ARGV[1]), tonumber(ARGV[2])
local tat = tonumber(redis.call('GET', KEYS[1]) or now)
if now < tat - tau then
  return {0, 'rate', math.ceil(tat - tau - now)}
end
local next_tat = math.max(tat, now) + period
store(KEYS[1], next_tat, next_tat - now)

-- Tokens per minute: the bucket's balance is tokens_per_min * (1 - (full_at - now) / window),
-- at most full; a request may start while it is not in debt (full_at - now <= window).
local window = tonumber(ARGV[3])
local full_at = tonumber(redis.call('GET', KEYS[2]) or now)
if full_at - now > window then
  return {0, 'tokens', math.ceil(full_at - now - window)}
end

-- Concurrency: leases whose expiry passed belong to dead nodes (or lost heartbeats).
local ttl, limit = tonumber(ARGV[5]), tonumber(ARGV[6])
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
if redis.call('ZCARD', KEYS[3]) >= limit then
  return {0, 'concurrency', 0}
end
redis.call('ZADD', KEYS[3], now + ttl, ARGV[4])
redis.call('PEXPIRE', KEYS[3], math.floor(2 * ttl / 1000) + 1000)
return {1, 'admitted', 0}
