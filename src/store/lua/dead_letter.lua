-- Move one pending entry to the dead-letter stream with the reason, then acknowledge
-- it, atomically: a poison entry is never both lost and acked, nor dead-lettered twice.
--
-- KEYS[1] source stream   KEYS[2] dead-letter stream
-- ARGV[1] group   ARGV[2] entry id   ARGV[3] reason   ARGV[4] deliveries   ARGV[5] now ms
-- Reply: 1 when dead-lettered, 0 when the entry was no longer pending (handled elsewhere).
local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[2], ARGV[2], 1)
if #p == 0 then
  return 0
end
local fields = {'dl_reason', ARGV[3], 'dl_stream', KEYS[1], 'dl_id', ARGV[2],
  'dl_group', ARGV[1], 'dl_deliveries', ARGV[4], 'dl_at', ARGV[5]}
local orig = redis.call('XRANGE', KEYS[1], ARGV[2], ARGV[2])
if #orig == 1 then
  for _, v in ipairs(orig[1][2]) do
    fields[#fields + 1] = v
  end
end
redis.call('XADD', KEYS[2], '*', unpack(fields))
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
return 1
