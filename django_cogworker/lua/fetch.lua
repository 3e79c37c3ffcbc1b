-- Reliable fetch from one or several queues, acknowledging finished jobs on
-- the way: while a worker is busy, one call acknowledges what its threads
-- finished and takes the next jobs for its idle threads.
-- KEYS[1..Q] = queue lists, in the order to try (strict, or a weighted
--              shuffle made by the caller); KEYS[Q+1] = this process's
--              in-progress list.
-- ARGV[1] = Q; ARGV[2] = how many jobs to take at most (from the first
-- queue that has any: one for the calling thread, one for each thread the
-- caller reserved a slot for, G19); ARGV[3..] =
-- finished jobs, exactly as fetched, to acknowledge (the first exit of an
-- ack, see acks.py; never recovered ones: those are acknowledged at once,
-- with their orphan counter, by ack.lua).
-- Returns {index of the queue, job, job...}; false when every queue is
-- empty; {0, "<key>: <error>"} when they are empty or broken.
-- A job is on exactly one of the two lists at every moment: the script is
-- atomic, so an RPOP then LPUSH is one move, as LMOVE is. On a full Redis
-- (maxmemory reached) a script whose first write may grow memory is refused
-- that write, LMOVE included; RPOP and LREM cannot grow it, and once a
-- script has written, Redis lets the rest of it write (6.2 and 7 alike). So
-- a first LMOVE refused for memory is done again as RPOP then LPUSH: a
-- worker goes on fetching from a full Redis, and every job it finishes
-- frees memory (SPEC section 8). On a server with room, and in a call that
-- acknowledges (it has written first), a job costs one LMOVE.
local nqueues = tonumber(ARGV[1])
local inprogress = KEYS[nqueues + 1]
for i = 3, #ARGV do
  redis.call("LREM", inprogress, 1, ARGV[i])
end
-- A queue key of the wrong type is skipped, not allowed to stop the others
-- (G12); when nothing was found the caller hears of it, to log it. Any
-- other error (READONLY from a demoted master, OOM) is the caller's as it
-- is: an outage, never "a broken queue".
local broken = nil
local want = tonumber(ARGV[2])
local wrote = #ARGV >= 3
for i = 1, nqueues do
  local job = redis.pcall("LMOVE", KEYS[i], inprogress, "RIGHT", "LEFT")
  if not wrote and type(job) == "table" and job.err and string.find(job.err, "OOM", 1, true) then
    job = redis.pcall("RPOP", KEYS[i])
    if type(job) == "string" then
      redis.call("LPUSH", inprogress, job)
    end
  end
  if type(job) == "string" then
    local reply = {i, job}
    for _ = 2, want do
      local next_job = redis.call("LMOVE", KEYS[i], inprogress, "RIGHT", "LEFT")
      if not next_job then break end
      table.insert(reply, next_job)
    end
    return reply
  elseif type(job) == "table" and job.err then
    if not string.find(job.err, "WRONGTYPE", 1, true) then
      return redis.error_reply(job.err)
    end
    broken = broken or KEYS[i] .. ": " .. job.err
  else
    wrote = true  -- an empty LMOVE or RPOP is a write too
  end
end
if broken then
  return {0, broken}
end
return false
