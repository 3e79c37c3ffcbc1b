-- Enqueue one slot of a periodic entry, exactly once across all processes.
-- KEYS[1] = the slot's marker (periodic:slot:<pjid>:<slot>), KEYS[2] = the
-- entry's running lock (periodic:running:<pjid>), KEYS[3] = the queue list,
-- KEYS[4] = queues set, KEYS[5] = periodic:last hash (pjid -> epoch s);
-- under SHARDING only the first three (the queue's group's), and the
-- caller writes the shared two after a push.
-- ARGV[1] = the payload, ARGV[2] = its queue name, ARGV[3] = the marker's TTL
-- (s), ARGV[4] = "1" if the entry is until_executed, ARGV[5] = the jid,
-- ARGV[6] = the running lock's queued TTL (s), ARGV[7] = pjid, ARGV[8] = now
-- (epoch s).
-- Returns 1 when pushed, 0 when the slot was handled already (by any
-- process), -1 when skipped because the previous run still holds the
-- running lock (the slot is marked: it is not tried again).
--
-- The marker is checked and set in the same call as the push: checked in a
-- separate call, two processes could both see no marker and both push.
if redis.call("EXISTS", KEYS[1]) == 1 then
  return 0
end
if ARGV[4] == "1" and redis.call("EXISTS", KEYS[2]) == 1 then
  redis.call("SET", KEYS[1], "skipped", "EX", ARGV[3])
  return -1
end
-- Push first: if it fails (the queue key of the wrong type) no marker is
-- left behind, and the next tick tries the slot again.
redis.call("LPUSH", KEYS[3], ARGV[1])
redis.call("SET", KEYS[1], ARGV[5], "EX", ARGV[3])
if ARGV[4] == "1" then
  redis.call("SET", KEYS[2], ARGV[5], "EX", ARGV[6])
end
if #KEYS > 3 then
  redis.pcall("SADD", KEYS[4], ARGV[2])
  redis.pcall("HSET", KEYS[5], ARGV[7], ARGV[8])
end
return 1
