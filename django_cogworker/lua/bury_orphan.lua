-- File one parked repeat orphan in dead, in one step.
-- KEYS[1] = repeat_orphans list, KEYS[2] = dead ZSET.
-- ARGV[1] = the parked job (the list's head), ARGV[2] = score, ARGV[3] = its
-- dead entry (the payload with the ProcessDied error).
-- Head only (the caller walks the list in order), so no LPOS: this runs on
-- servers too old for reliable fetch.
if redis.call("LINDEX", KEYS[1], 0) ~= ARGV[1] then
  return 0
end
redis.call("ZADD", KEYS[2], ARGV[2], ARGV[3])
redis.call("LPOP", KEYS[1])
return 1
