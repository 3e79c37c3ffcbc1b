--! include limits.lua
-- Under SHARDING (limits/sharded.py), the limiter's side of parking a job
-- whose code met a full limiter, and of a wake: the room it has now.
-- KEYS[1..4] = used, promoted, max, queues (lib/limits.lua).
-- ARGV[1] = kind ("c", "r"), ARGV[2] = n, ARGV[3] = per (s), ARGV[4] =
-- promoted TTL (s), ARGV[5] = the parking job's jid, or "" (a wake: only
-- asks), ARGV[6] = its queue's name.
-- Returns {free slots, seconds until a full rate window has room, 1 if the
-- parking job had been promoted}. A parking job's reservation is dropped
-- (it goes back on its queue, or to the head of the line, as park.lua
-- does); with no room, its queue is noted in `queues` before the caller
-- parks it, so that a wake looks there.
local now = limiter_now()
local kind, n, per = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local me = ARGV[5] ~= "" and ARGV[5] or false
local free = free_slots(kind, KEYS[1], KEYS[2], KEYS[3], n, per, now, tonumber(ARGV[4]), me)
local was = 0
if me then
  was = redis.call("ZREM", KEYS[2], me)
  if free <= 0 then redis.call("SADD", KEYS[4], ARGV[6]) end
end
return {free, tostring(wait_s(kind, KEYS[1], per, now)), was}
