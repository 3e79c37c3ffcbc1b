-- Acknowledge a finished job.
-- KEYS[1] = in-progress list, KEYS[2] = the job's orphan counter.
-- ARGV[1] = the job exactly as fetched.
-- The counter goes too: the job got to finish, so the crashes it sat through
-- before were not its doing.
redis.call("LREM", KEYS[1], 1, ARGV[1])
redis.pcall("DEL", KEYS[2])
return 1
