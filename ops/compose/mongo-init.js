// Runs once, when the data volume is first initialised
// (docker-entrypoint-initdb.d): the application user cachewright connects
// as. `read` is all rebuild, watch and serve need (change streams
// included); `cachewright migrate` needs readWrite and is best run as a
// separate, short-lived user.
const app = process.env.MONGO_APP_DB || "app";
db.getSiblingDB("admin").createUser({
  user: process.env.MONGO_APP_USER,
  pwd: process.env.MONGO_APP_PASSWORD,
  roles: [{ role: "read", db: app }],
});
