-- close a room: no more joins, no more admissions; streams see `closed`.
-- Returns {r = 'ok', view = {...}} | {r = 'noroom'}
if not room({}) then return reply({r = 'noroom'}) end
set('closed', '1')
changed()
return reply({r = 'ok', view = view_fields()})
