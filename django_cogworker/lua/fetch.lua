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
-- atomic, and it writes the jobs onto the in-progress list (LPUSH) before it
-- takes them off their queue (LTRIM), so a push refused (a key of the wrong
-- type) loses none (G5). Three commands a call, where an LMOVE per job cost
-- one a job (docs/performance.md, "What a job costs Redis").
-- On a full Redis (maxmemory reached) Redis refuses a script's first write
-- when it may grow memory, LPUSH included; RPOP and LREM cannot grow it, and
-- once a script has written, Redis lets the rest of it write (6.2 and 7
-- alike). So a first LPUSH refused for memory is done again after an RPOP
-- of the same jobs: a worker goes on fetching from a full Redis, and every
-- job it finishes frees memory (SPEC section 8). On a server with room, and
-- in a call that acknowledges (it has written first), the push comes first.
-- An acknowledged job was fetched before the jobs still running, so it
-- lies toward the tail: LREM looks from there (count -1).
local PUSH_AT_ONCE = 500  -- jobs per LPUSH: Lua's unpack() has a limit

local function push(list, jobs, call)
  for first = 1, #jobs, PUSH_AT_ONCE do
    local done = call("LPUSH", list, unpack(jobs, first, math.min(first + PUSH_AT_ONCE - 1, #jobs)))
    if type(done) == "table" and done.err then
      return done
    end
  end
  return nil
end

local nqueues = tonumber(ARGV[1])
local inprogress = KEYS[nqueues + 1]
for i = 3, #ARGV do
  redis.call("LREM", inprogress, -1, ARGV[i])
end
-- A queue key of the wrong type is skipped, not allowed to stop the others
-- (G12); when nothing was found the caller hears of it, to log it. Any
-- other error (READONLY from a demoted master, OOM) is the caller's as it
-- is: an outage, never "a broken queue".
local broken = nil
local want = tonumber(ARGV[2])
local wrote = #ARGV >= 3
for i = 1, nqueues do
  local jobs = redis.pcall("LRANGE", KEYS[i], -want, -1)
  if jobs.err then
    if not string.find(jobs.err, "WRONGTYPE", 1, true) then
      return redis.error_reply(jobs.err)
    end
    broken = broken or KEYS[i] .. ": " .. jobs.err
  elseif #jobs > 0 then
    -- The oldest (the tail) first, as the queue is popped.
    for left = 1, math.floor(#jobs / 2) do
      local right = #jobs - left + 1
      jobs[left], jobs[right] = jobs[right], jobs[left]
    end
    local refused = push(inprogress, jobs, redis.pcall)
    if refused then
      if wrote or not string.find(refused.err, "OOM", 1, true) then
        return redis.error_reply(refused.err)
      end
      redis.call("RPOP", KEYS[i], #jobs)
      push(inprogress, jobs, redis.call)
    else
      redis.call("LTRIM", KEYS[i], 0, -#jobs - 1)
    end
    table.insert(jobs, 1, i)
    return jobs
  end
end
if broken then
  return {0, broken}
end
return false
