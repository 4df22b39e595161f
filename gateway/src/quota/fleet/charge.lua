-- Charges tokens against a tenant's tokens-per-minute bucket (GCRA over tokens, as admit.lua);
-- a negative count refunds, up to a full bucket.
-- KEYS[1] tokens: when the bucket is full again, microseconds.
-- ARGV[1] tokens (negative: a refund).   ARGV[2] window_us (60 s).   ARGV[3] tokens_per_min.
-- ARGV[4] now_us, or '' for the server's clock.
-- Returns the bucket's balance after the charge, in tokens (negative: in debt), as a string.
local now
if ARGV[4] ~= '' then
  now = tonumber(ARGV[4])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local tokens, window, per_min = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local full_at = math.max(tonumber(redis.call('GET', KEYS[1]) or now), now)
full_at = math.max(full_at + tokens * window / per_min, now)
redis.call('SET', KEYS[1], string.format('%.17g', full_at), 'PX',
  math.floor((full_at - now) / 1000) + 1000)
return string.format('%.17g', per_min * (1 - (full_at - now) / window))
