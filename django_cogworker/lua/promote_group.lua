-- Under SHARDING (limits/sharded.py), a wake's part in a queue group's
-- slot, once reserve.lua has reserved their slots: the waiters named, if
-- still at the head of their line, in order, moved back onto the end of
-- the queue fetched next; the group's note of the waiting list dropped
-- once it is empty, in the same step.
-- KEYS[1] = the waiting list, KEYS[2] = the queue, KEYS[3] = the group's
-- waiters hash. ARGV[1] = the waiters field; then the jobs, as the caller
-- read them at the head of the list.
-- Returns {1 if none is left waiting, else 0; how many moved}: the caller
-- drops the reservations of the others.
local moved = 0
for i = 2, #ARGV do
  if redis.call("LINDEX", KEYS[1], 0) ~= ARGV[i] then break end
  redis.call("RPUSH", KEYS[2], redis.call("LPOP", KEYS[1]))
  moved = moved + 1
end
if redis.call("EXISTS", KEYS[1]) == 0 then
  redis.call("HDEL", KEYS[3], ARGV[1])
  return {1, moved}
end
return {0, moved}
