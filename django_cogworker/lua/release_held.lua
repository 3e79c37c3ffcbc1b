--! include limits.lua
-- Under SHARDING (limits/sharded.py), where a job's lists and its limiters
-- are in two slots: frees slots a process holds, only where it still holds
-- them (G18: a revived process's late release frees nothing another
-- process took): a finished job's, or every one of a process found dead
-- (G23).
-- KEYS[1] = the process's holds set, then each slot's holders hash.
-- ARGV[1] = the process's identity, then two per slot: the limiter's name
-- and the jid.
-- Returns how many were freed.
local freed = 0
for s = 1, #KEYS - 1 do
  freed = freed + release_slot(KEYS[1 + s], KEYS[1], ARGV[2 * s], ARGV[2 * s + 1], ARGV[1])
end
return freed
