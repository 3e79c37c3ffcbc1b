-- retake_running_lock(lock_key, jid, lock_ttl): the rule of the running lock
-- of an `until_executed` periodic run: taken when free, extended when this
-- run owns it, never taken from another run.
--
-- requeue_job(job, queue_key, lock_key, jid, lock_ttl)
-- Puts one job back onto the end its queue is popped from (RPUSH: queues are
-- pushed on the left and popped from the right), so it runs next. A job of
-- an `until_executed` periodic entry re-takes its running lock on the way
-- (`lock_key` given, else false), so the ticker cannot start the next slot
-- beside the requeued run. The caller read the payload and passes every
-- key: none is built here.
local function retake_running_lock(lock_key, jid, lock_ttl)
  local owner = redis.call("GET", lock_key)
  if (not owner) or owner == jid then
    redis.call("SET", lock_key, jid, "EX", lock_ttl)
  end
end

local function requeue_job(job, queue_key, lock_key, jid, lock_ttl)
  if lock_key then
    retake_running_lock(lock_key, jid, lock_ttl)
  end
  redis.call("RPUSH", queue_key, job)
end
