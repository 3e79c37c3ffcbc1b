-- Forget an idle limiter's name (the sweep, limits/state.py): only if it
-- still has no holder, start, waiter, reservation or override, since a job
-- may have taken it after the sweep looked.
-- KEYS[1] = the registry (N:limits); KEYS[2..6] = its holders, starts,
-- queues, promoted and max keys. ARGV[1] = the name.
-- Returns 1 when forgotten, else 0.
for i = 2, 6 do
  if redis.call("EXISTS", KEYS[i]) == 1 then return 0 end
end
return redis.call("HDEL", KEYS[1], ARGV[1])
