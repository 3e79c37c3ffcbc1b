-- Reliable fetch from one or several queues, acknowledging the thread's
-- previous job on the way: while a worker is busy, a job costs one round
-- trip, not two.
-- KEYS[1..n-2] = queue lists, in the order to try (strict, or a weighted
--                shuffle made by the caller); KEYS[n-1] = this process's
--                in-progress list; KEYS[n] = the orphan counter of the job
--                acknowledged (any key of ours when there is none).
-- ARGV[1] = the previous job exactly as fetched, to acknowledge ("" = none);
-- ARGV[2] = "1" if that job was ever recovered from a dead process (its
-- payload carries "orphaned"), so its orphan counter must go too.
-- Returns {index of the queue, job}, or false when every queue is empty.
-- LMOVE is atomic: the job is on exactly one of the two lists at every moment.
local inprogress = KEYS[#KEYS - 1]
if ARGV[1] ~= "" then
  redis.call("LREM", inprogress, 1, ARGV[1])
  if ARGV[2] == "1" then
    -- It got to finish: the crashes it sat through before were not its doing.
    redis.pcall("DEL", KEYS[#KEYS])
  end
end
for i = 1, #KEYS - 2 do
  local job = redis.call("LMOVE", KEYS[i], inprogress, "RIGHT", "LEFT")
  if job then
    return {i, job}
  end
end
return false
