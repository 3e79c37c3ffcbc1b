--! include limits.lua
-- Wake a limiter's waiters (SPEC section 14): move as many as it has room
-- for back onto their queues, oldest first, queue by queue. Called when a
-- limit is raised (api.Limit.set), after a dead process's slots are freed
-- (G23), for a rate window that reopened, and by the sweep of each poller
-- pass (a safety net for any wake that was missed).
-- KEYS[1..4] = used, promoted, max, queues (lib/limits.lua); then 2 per
-- queue with waiters: its waiting list, the queue.
-- ARGV[1] = kind ("c", "r"), ARGV[2] = n, ARGV[3] = per (s), ARGV[4] =
-- promoted TTL (s); then each queue's name, in the order of KEYS.
-- Returns {how many moved, seconds until a full rate window has room for
-- the waiters left (0: none left, or a release wakes them)}.
local now = limiter_now()
local kind, n, per = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local free = free_slots(kind, KEYS[1], KEYS[2], KEYS[3], n, per, now, tonumber(ARGV[4]), false)
local moved = 0
local q = 0
while free > moved and 5 + 2 * q <= #KEYS do
  moved = moved + promote(KEYS[5 + 2 * q], KEYS[6 + 2 * q], KEYS[4], ARGV[5 + q], KEYS[2], free - moved, now)
  q = q + 1
end
if redis.call("EXISTS", KEYS[4]) == 0 then
  return {moved, "0"}
end
return {moved, tostring(wait_s(kind, KEYS[1], per, now))}
