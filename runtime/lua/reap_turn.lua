-- The reaping of a sharded queue's shards, done by one process at a time: takes, or keeps, the
-- queue's turn, and tells its holder which shards to reap. Processes note in <prefix>leased, a
-- sorted set, until when they hold leases in which shard (members '<shard>|<holder>', each
-- scored by a time past its leases' deadlines, in ms since the epoch): a member whose time has
-- come is a shard where a lease may have run out, its holder having stopped renewing it.
-- KEYS[1] <prefix>turn:reap  KEYS[2] <prefix>leased
-- ARGV[1] holder  ARGV[2] the turn's time to live (ms)  ARGV[3] now (ms since the epoch)
-- Returns: {0} while another holder has the turn; else {1, then the members whose time has come,
--   taken out of the set}.
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[1] then return {0} end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
local due = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', ARGV[3])
if #due > 0 then redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', ARGV[3]) end
table.insert(due, 1, 1)
return due
