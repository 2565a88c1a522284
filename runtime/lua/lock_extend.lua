-- Renews a distributed lock if the caller still owns it (compare-and-pexpire).
-- KEYS[1] the lock. ARGV[1] token  ARGV[2] ttl ms. Returns 1: renewed, 0: lost (gone or another's).
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
