-- The fenced write: only the holder of the room's newest fencing token
-- writes, so an owner paused past its lease cannot write beside its
-- successor. KEYS[1] = the room's fence, KEYS[2] = its log (or its image);
-- ARGV[1] = the writer's token, ARGV[2] = a batch (or an image);
-- ARGV[3], for an image only, the log position it covers.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return redis.error_reply('FENCED the lease passed to another owner')
end
if ARGV[3] then
  redis.call('HSET', KEYS[2], 'at', ARGV[3], 'image', ARGV[2])
  return ARGV[3]
end
return redis.call('XADD', KEYS[2], '*', 'b', ARGV[2])
