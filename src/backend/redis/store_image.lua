-- The fenced image: only the holder of the room's newest fencing token
-- stores the room's image, so an owner paused past its lease cannot put
-- an older one over its successor's. KEYS[1] = the room's fence, KEYS[2]
-- = its image; ARGV[1] = the writer's token, ARGV[2] = the image, ARGV[3]
-- = the log position it covers.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return redis.error_reply('FENCED the lease passed to another owner')
end
redis.call('HSET', KEYS[2], 'at', ARGV[3], 'image', ARGV[2])
return ARGV[3]
