-- One list entry moved from the one-slot layout into its queue group's list
-- (migrate_layout.py, SPEC section 16), unless a run before did it: the
-- group keeps the digest of each entry it took in, for a rerun after a stop
-- between this call and the entry's removal from its old list.
-- KEYS[1] = the list it goes to, KEYS[2] = the group's migrated set.
-- ARGV[1] = the entry, ARGV[2] = its digest, ARGV[3] = the set's TTL (s).
-- Returns 1 when pushed, 0 when a run before had pushed it.
if redis.call("SISMEMBER", KEYS[2], ARGV[2]) == 1 then
  return 0
end
redis.call("LPUSH", KEYS[1], ARGV[1])
redis.call("SADD", KEYS[2], ARGV[2])
redis.call("EXPIRE", KEYS[2], ARGV[3])
return 1
