--! include batches.lua
-- Apply one end of a batch's member, taken from its group's outbox, to
-- its batch (SHARDING: SPEC sections 13 and 16; workflows/forward.py).
-- KEYS and ARGV from 1 and 4 as batch_member_end() in lib/batches.lua
-- reads them, with {N}:forward in place of N:schedule and of the next
-- step's queue: what the end starts is forwarded to its group.
-- ARGV[1] = the group, ARGV[2] = the end's number in its outbox, ARGV[3] =
-- "@batch".
-- An outbox is applied in order, but a forwarder stopped halfway may
-- apply an end again after later ones: the member's batch keeps the
-- number of the last end applied from each group ("seq:<group>") and
-- takes none twice, nor an older one after a newer.
-- Returns 1 if the member moved, else 0.
local count = tonumber(ARGV[6])
if count > 0 and redis.call("EXISTS", KEYS[6]) == 1 then
  local field = "seq:" .. ARGV[1]
  local seq = tonumber(ARGV[2])
  if seq <= tonumber(redis.call("HGET", KEYS[6], field) or "0") then
    return 0
  end
  redis.call("HSET", KEYS[6], field, ARGV[2])
end
return batch_member_end(1, 4)
