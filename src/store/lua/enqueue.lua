-- Dedup + append of one verified webhook delivery, atomically (DESIGN §3).
--
-- Redis runs a script to completion before any other command, and the AOF records
-- its effects as one MULTI/EXEC block, so no reader and no restart can observe the
-- delivery marked seen without its entry in the stream.
--
-- KEYS[1]  dedup marker of the delivery id   ({prefix:shard}:seen:<delivery>)
-- KEYS[2]  events stream of the shard        ({prefix:shard}:events)
-- ARGV[1]  retention in milliseconds: TTL of the marker
-- ARGV[2..] field/value pairs of the stream entry
--
-- No trimming here: an age bound at append time would drop entries no worker has
-- processed yet. The workers trim what every group has acknowledged (worker/trim.rs).
--
-- Returns {1, id} when queued, {0, id} when the delivery id was already queued as id.
local prev = redis.call('GET', KEYS[1])
if prev then
  return {0, prev}
end
local id = redis.call('XADD', KEYS[2], '*', unpack(ARGV, 2))
redis.call('SET', KEYS[1], id, 'PX', ARGV[1])
return {1, id}
