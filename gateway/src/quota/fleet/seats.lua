-- Takes several concurrency leases of a tenant at once, all or none: the other sequences of a
-- request already admitted by admit.lua (its prompts x best_of). Rate and tokens are not
-- checked again.
-- KEYS[1] leases: sorted set of concurrency leases scored by their expiry, microseconds.
-- ARGV[1] lease ttl_us.   ARGV[2] max_concurrent.   ARGV[3] now_us, or ''.
-- ARGV[4..] the new leases' ids.
-- Returns 1 when every lease is held, 0 when they would exceed max_concurrent (none taken).
local now
if ARGV[3] ~= '' then
  now = tonumber(ARGV[3])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local ttl, limit = tonumber(ARGV[1]), tonumber(ARGV[2])
local wanted = #ARGV - 3
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) + wanted > limit then
  return 0
end
for i = 4, #ARGV do
  redis.call('ZADD', KEYS[1], now + ttl, ARGV[i])
end
redis.call('PEXPIRE', KEYS[1], math.floor(2 * ttl / 1000) + 1000)
return 1
