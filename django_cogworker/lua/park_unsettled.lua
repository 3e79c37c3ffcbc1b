--! include full_redis.lua
-- At shutdown, hand a failed job whose filing in retry/dead kept failing to
-- the unsettled list, with the record of where it should go, so that any
-- live process files it later (G6) instead of it being run again.
-- KEYS[1] = in-progress list, KEYS[2] = unsettled list.
-- ARGV[1] = the job as fetched, ARGV[2] = its record
-- {"set": key, "score": n, "payload": text}.
if not redis.call("LPOS", KEYS[1], ARGV[1]) then
  return 0
end
writable_when_full(KEYS[1])
redis.call("RPUSH", KEYS[2], ARGV[2])
redis.call("LREM", KEYS[1], 1, ARGV[1])
return 1
