--! include limits.lua
-- Release the slots a running job took in its code (`with
-- limiter.acquire():`), when the block ends; the slots a job holds at its
-- end are released by ack.lua or file.lua.
-- KEYS and ARGV as release_slots() in lib/limits.lua reads them, from 1.
-- Returns how many limiters have room and waiters on other queues.
return release_slots(1, 1)
