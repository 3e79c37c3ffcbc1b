--! include limits.lua
-- Under SHARDING (limits/sharded.py), a wake's part in the limiter's slot,
-- before its waiters are moved in their group (promote_group.lua): as many
-- slots as it has room for reserved, for the first of the waiters the
-- caller read at the head of a line, so that no newcomer takes them and
-- that they find them reserved from the moment they can be fetched.
-- KEYS[1..4] = used, promoted, max, queues (lib/limits.lua).
-- ARGV[1] = kind ("c", "r"), ARGV[2] = n, ARGV[3] = per (s), ARGV[4] =
-- promoted TTL (s); then the waiters' jids, head first.
-- Returns {free slots before, seconds until a full rate window has room,
-- how many reserved}.
local now = limiter_now()
local kind, n, per = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local free = free_slots(kind, KEYS[1], KEYS[2], KEYS[3], n, per, now, tonumber(ARGV[4]), false)
local reserved = 0
for i = 5, #ARGV do
  if reserved >= free then break end
  redis.call("ZADD", KEYS[2], now, ARGV[i])
  reserved = reserved + 1
end
return {free, tostring(wait_s(kind, KEYS[1], per, now)), reserved}
