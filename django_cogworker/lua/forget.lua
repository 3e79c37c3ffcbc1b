-- Forget a recovered process: its registration in inprogress_identities,
-- its last-beat stamp, its place in the processes set and its running-jobs
-- record. Only when, atomically: its presence key is gone (a beat that
-- landed since the recovery keeps it registered), its in-progress list is
-- empty, and no fetch of its own can still fill that list: a process
-- decides to send none later than HEARTBEAT_TTL after its last beat, and a
-- blocking one waits on the server for a bounded time after that (G18);
-- ARGV[2] is that whole span, measured on Redis's clock from the stamp.
-- A fetch decided before a stop and sent in the moment after it resumed
-- can still fill the list: the process is noted in the forgotten set,
-- where recovery looks for such a list (remember.lua).
--
-- KEYS[1] = the in-progress list, KEYS[2] = its owner's presence key,
-- KEYS[3] = last_beat hash, KEYS[4] = inprogress_identities set,
-- KEYS[5] = the forgotten set (identity -> when forgotten, Redis's clock),
-- KEYS[6] = processes set, KEYS[7] = the owner's running-jobs hash; under
-- SHARDING only the first five (the group's), and the caller removes the
-- shared records once this returns 1.
-- ARGV[1] = the owner's identity, ARGV[2] = the span (s).
-- Returns 1 when forgotten, 0 when kept.
if redis.call("EXISTS", KEYS[2]) == 1 or redis.call("LLEN", KEYS[1]) > 0 then
  return 0
end
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call("TIME")
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
-- A stamp that is not a number counts as no stamp, as in requeue.lua.
local last = tonumber(redis.call("HGET", KEYS[3], ARGV[1]) or "")
if last and now - last <= tonumber(ARGV[2]) then
  return 0
end
redis.call("SREM", KEYS[4], ARGV[1])
redis.call("HDEL", KEYS[3], ARGV[1])
redis.call("ZADD", KEYS[5], string.format("%.6f", now), ARGV[1])
if #KEYS > 5 then
  redis.call("SREM", KEYS[6], ARGV[1])
  redis.call("DEL", KEYS[7])
end
return 1
