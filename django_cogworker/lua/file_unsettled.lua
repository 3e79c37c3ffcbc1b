-- File one unsettled record where it belongs, then drop the record.
-- KEYS[1] = unsettled list, KEYS[2] = the retry or dead ZSET it names.
-- ARGV[1] = the record (the list's head), ARGV[2] = score, ARGV[3] = payload.
if redis.call("LINDEX", KEYS[1], 0) ~= ARGV[1] then
  return 0
end
redis.call("ZADD", KEYS[2], ARGV[2], ARGV[3])
redis.call("LPOP", KEYS[1])
return 1
