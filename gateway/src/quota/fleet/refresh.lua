-- Extends a running request's concurrency lease (the heartbeat). A lease that already expired
-- (and may have been dropped by admit.lua) is not brought back: the slot may be another's now.
-- KEYS[1] leases.   ARGV[1] lease id.   ARGV[2] ttl_us.   ARGV[3] now_us, or ''.
-- Returns 1 when the lease was extended, 0 when it was gone.
local now
if ARGV[3] ~= '' then
  now = tonumber(ARGV[3])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local expiry = tonumber(redis.call('ZSCORE', KEYS[1], ARGV[1]))
if expiry == nil or expiry <= now then
  return 0
end
local ttl = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], 'XX', now + ttl, ARGV[1])
redis.call('PEXPIRE', KEYS[1], math.floor(2 * ttl / 1000) + 1000)
return 1
