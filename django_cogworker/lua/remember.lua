--! include full_redis.lua
-- Remember a forgotten process whose in-progress list holds jobs again
-- (G18): registers it again, stamped as if it had beaten now, so that
-- recovery looks at its list on every pass from here on, and takes it back
-- once the owner has stayed silent for ORPHAN_THRESHOLD (requeue.lua).
-- Only the owner's own fetch fills that list: one it decided to send before
-- a stop and sent in the moment after it resumed, before its first beat.
-- The fresh stamp gives an owner that did resume the whole threshold to
-- beat and keep its jobs.
--
-- KEYS[1] = the forgotten set (identity -> when forgotten), KEYS[2] = the
-- owner's in-progress list, KEYS[3] = inprogress_identities set,
-- KEYS[4] = last_beat hash.
-- ARGV[1] = the owner's identity.
-- Returns 1 when registered again, 0 when there was nothing to do (no
-- longer forgotten, registered again by a beat, or its list empty).
if not redis.call("ZSCORE", KEYS[1], ARGV[1]) then
  return 0
end
if redis.call("SISMEMBER", KEYS[3], ARGV[1]) == 1 then
  redis.call("ZREM", KEYS[1], ARGV[1])
  return 0
end
if redis.call("LLEN", KEYS[2]) == 0 then
  return 0
end
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call("TIME")
writable_when_full(KEYS[2])
redis.call("SADD", KEYS[3], ARGV[1])
redis.call("HSET", KEYS[4], ARGV[1], string.format("%.6f", tonumber(t[1]) + tonumber(t[2]) / 1000000))
redis.call("ZREM", KEYS[1], ARGV[1])
return 1
