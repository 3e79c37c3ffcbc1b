--! include batches.lua
-- Move one member in its batch, on its own: a member dropped by the poller
-- as expired (SPEC section 14: it counts as succeeded), whose drop has no
-- ack to ride; a member's success under basic fetch (no list, no ack),
-- its chain's next step pushed in the same step.
-- KEYS and ARGV as batch_member_end() in lib/batches.lua reads them, from 1
-- (ARGV[1] = "@batch", the marker the other callers share).
-- Returns 1 if the member moved, else 0.
return batch_member_end(1, 2)
