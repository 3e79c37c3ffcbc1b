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
-- Returns {index of the queue, job}; false when every queue is empty;
-- {0, "<key>: <error>"} when they are empty or broken.
-- LMOVE is atomic: the job is on exactly one of the two lists at every moment.
local inprogress = KEYS[#KEYS - 1]
if ARGV[1] ~= "" then
  redis.call("LREM", inprogress, 1, ARGV[1])
  if ARGV[2] == "1" then
    -- It got to finish: the crashes it sat through before were not its doing.
    redis.pcall("DEL", KEYS[#KEYS])
  end
end
-- A queue key of the wrong type is skipped, not allowed to stop the others
-- (G12); when nothing was found the caller hears of it, to log it.
local broken = nil
for i = 1, #KEYS - 2 do
  local job = redis.pcall("LMOVE", KEYS[i], inprogress, "RIGHT", "LEFT")
  if type(job) == "string" then
    return {i, job}
  elseif type(job) == "table" and job.err then
    broken = broken or KEYS[i] .. ": " .. job.err
  end
end
if broken then
  return {0, broken}
end
return false
