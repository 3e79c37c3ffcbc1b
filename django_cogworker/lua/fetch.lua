-- Reliable fetch from several queues in one call.
-- KEYS[1..n-1] = queue lists, in the order to try (strict, or a weighted
--                shuffle made by the caller); KEYS[n] = this process's
--                in-progress list.
-- Returns {index of the queue, job}, or false when every queue is empty.
-- LMOVE is atomic: the job is on exactly one of the two lists at every moment.
local inprogress = KEYS[#KEYS]
for i = 1, #KEYS - 1 do
  local job = redis.call("LMOVE", KEYS[i], inprogress, "RIGHT", "LEFT")
  if job then
    return {i, job}
  end
end
return false
