-- snapshot: the line of every lane of a room as a follower of its change
-- log starts from (on a late start, after a reconnect, or after it missed
-- entries), all read in one atomic step together with the log position it
-- reflects, so following the log from that id loses and repeats nothing.
-- Returns an array: the JSON
--   {r = 'ok', epoch, open, order, seed, drawn, placed, view, version,
--    lanes = [{head, from, back = [qi...]} per lane], id = last log id,
--    seq = its seq}
-- then each ticket's lane, one byte per ticket id (`ln`; empty in a room
-- without lanes), then per lane the departed bitmap of its queue indices
-- [from, next) as raw bytes (`from` is the lane's `head` rounded down to a
-- byte); or {r = 'noroom'} and ''.
if not room({'issued', 'open', 'order', 'seed', 'drawn', 'placed', 'view', 'view_version'}) then
  return {reply({r = 'noroom'}), ''}
end
local lanes, bitmaps = {}, {}
for l = 0, LANES - 1 do
  -- The lane's next queue index: without lanes, every ticket's is its id.
  local next_qi = n('issued')
  if LANED then next_qi = n('lq' .. l) end
  -- Every slot below the lowest one still queued was popped or departed,
  -- so the lane's head can be taken to be that slot (or its end).
  local head = next_qi
  local first = redis.call('ZRANGE', LK('q', l), 0, 0, 'WITHSCORES')
  if #first > 0 then head = tonumber(first[2]) end
  local from = head - head % 8
  local bits = ''
  if next_qi > from then
    bits = redis.call('GETRANGE', LK('dep', l), from / 8, math.floor((next_qi - 1) / 8))
  end
  local back = {}
  local returners = redis.call('ZRANGE', LK('back', l), 0, -1, 'WITHSCORES')
  for i = 2, #returners, 2 do back[#back + 1] = tonumber(returners[i]) end
  lanes[#lanes + 1] = {head = head, from = from, back = back}
  bitmaps[#bitmaps + 1] = bits
end
local ln = ''
if LANED then ln = redis.call('GET', K('ln')) or '' end
local last = redis.call('XREVRANGE', LOG, '+', '-', 'COUNT', 1)
local id = '0-0'
if #last > 0 then id = last[1][1] end
local out = {reply({r = 'ok', epoch = EPOCH, open = M['open'] == '1', order = M['order'] or '',
  seed = M['seed'] or '', drawn = n('drawn'), placed = n('placed'), view = M['view'] or '',
  version = n('view_version'), lanes = lanes, id = id,
  seq = tonumber(redis.call('GET', P .. 'lseq') or '0')}), ln}
for _, bits in ipairs(bitmaps) do out[#out + 1] = bits end
return out
