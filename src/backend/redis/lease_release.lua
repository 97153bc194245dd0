-- compare-and-delete: KEYS[1] = the lease, ARGV[1] = owner token. Only the
-- owner gives the lease up, never a successor's.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
