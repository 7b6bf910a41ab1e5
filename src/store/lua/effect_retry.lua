-- Park an effects-stream entry for a later try, atomically: add it to the shard's
-- retry set (score: when to try again, unix ms) and acknowledge it. The member is the
-- entry's field/value list as a JSON array (with the updated attempt count), so it is
-- unique per effect and attempt and can be queued again as it is.
--
-- KEYS[1] effects stream   KEYS[2] retry set (zset)
-- ARGV[1] consumer group   ARGV[2] entry id   ARGV[3] due (unix ms)   ARGV[4] member
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[4])
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
return 1
