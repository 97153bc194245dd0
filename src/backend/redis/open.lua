-- open a scheduled room: ARGV[3] = '1' when an operator opens it now
-- (opens_at becomes now), ARGV[4] = how many pre-queue tickets the caller
-- drew, ARGV[5..] = those ticket ids in drawn order. The draw (SHA-256 of
-- the seed and each id, engine::LotterySeed) is done by the caller, since
-- Redis' Lua has no SHA-256; tickets that joined the pre-queue after the
-- caller read it arrived after opens_at and queue behind the draw, in
-- arrival order. Queue indices go from 0 in that order, so every ticket
-- issued before opening has one below every ticket issued after. The drawn
-- order is kept (`<epoch>:draw`, ids joined by commas) as the draw's
-- public record.
-- In a room with lanes each ticket is placed in its own lane, the lanes
-- taking their tickets in the same drawn order, each numbered from 0.
-- Logged as one 'o' event per lane: followers reload the line from a
-- snapshot.
-- Returns {r = 'ok', view = {...}} | {r = 'already'} | {r = 'noroom'}
if not room({'open'}) then return reply({r = 'noroom'}) end
if M['open'] == '1' then return reply({r = 'already'}) end
local drawn = tonumber(ARGV[4])
local pre = redis.call('LRANGE', K('pre'), 0, -1)
local placed, qi, total = {}, {}, 0
for l = 0, LANES - 1 do qi[l] = 0 end
local function place(sid)
  if placed[sid] then return end
  placed[sid] = true
  local t = load_ticket(sid)
  if not t then return end
  total = total + 1
  t.qi = qi[t.lane]
  qi[t.lane] = qi[t.lane] + 1
  if t.state == WAITING then
    local q = LK('q', t.lane)
    redis.call('ZADD', q, t.qi, S(t.id))
    t.init = redis.call('ZCARD', q) - 1
    t.shown = t.init
    redis.call('ZADD', K('seen'), t.seen, S(t.id))
  else
    -- Left before the opening: its slot counts as departed.
    redis.call('SETBIT', LK('dep', t.lane), t.qi, 1)
  end
  save_ticket(t)
end
local record = {}
for i = 1, drawn do
  place(ARGV[4 + i])
  record[i] = ARGV[4 + i]
end
redis.call('SET', K('draw'), table.concat(record, ','))
for _, sid in ipairs(pre) do place(sid) end
redis.call('DEL', K('pre'))
set('open', '1')
-- Followers place the drawn tickets again from the published seed and
-- this count (every ticket issued before the read was drawn; the rest went
-- in arrival order, so without lanes each one's queue index is its id;
-- with lanes a follower also reads each ticket's lane, `ln`, and needs to
-- know where the pre-queue ended, `placed`).
set('drawn', S(drawn))
set('placed', S(total))
for l = 0, LANES - 1 do
  if LANED then set('lq' .. l, S(qi[l])) end
  log_open(l, drawn, qi[l])
end
if ARGV[3] == '1' then set('opens_at', S(NOW)) end
changed()
return reply({r = 'ok', view = view_fields()})
