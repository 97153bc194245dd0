-- compare-and-extend: KEYS[1] = the lease, ARGV[1] = owner token,
-- ARGV[2] = lease ms. Only the owner extends; 1 if extended.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
