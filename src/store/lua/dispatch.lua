-- Append one message to the dispatch stream at most once per effect id: the marker
-- and the entry are written together, so a retried or redelivered Dispatch effect
-- never queues its work item twice. The marker key carries the dispatch stream's name
-- as its hash tag, so both keys live in one Redis Cluster slot.
--
-- KEYS[1] dispatch stream (<prefix>:dispatch)   KEYS[2] marker ({<prefix>:dispatch}:sent:<effect id>)
-- ARGV[1] marker TTL in milliseconds   ARGV[2] field name   ARGV[3] JSON value
-- Reply: the new entry id, or false when this effect was appended before.
if not redis.call('SET', KEYS[2], '1', 'NX', 'PX', ARGV[1]) then
  return false
end
return redis.call('XADD', KEYS[1], '*', ARGV[2], ARGV[3])
