-- Who a session is of within its tenant (keep in step with ../postgres/0018_session_people.sql):
-- the user who created it and how to show them, and who may answer its permission requests and
-- elicitations (`anyone`, `owner`, `author`; NULL: the tenant's default).
ALTER TABLE sessions ADD COLUMN owner TEXT;
ALTER TABLE sessions ADD COLUMN owner_name TEXT;
ALTER TABLE sessions ADD COLUMN who_answers TEXT;
CREATE INDEX sessions_owner ON sessions (tenant, owner) WHERE owner IS NOT NULL;
