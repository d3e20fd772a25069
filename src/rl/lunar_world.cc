/* LunarLander's Box2D world (lunar_world.h): Gymnasium's lunar_lander.py
 * reset() and ContactDetector, body for body, in Box2D 2.4's C++ API. */
#include "lunar_world.h"

#include <box2d/box2d.h>

#include <new>

namespace {

const double SCALE = DT_LUNAR_SCALE;
const int LANDER_POLY[6][2] = { { -14, 17 }, { -17, 0 }, { -17, -10 }, { 17, -10 }, { 17, 0 }, { 14, 17 } };
const double LEG_AWAY = 20, LEG_W = 2, LEG_H = 8, LEG_SPRING_TORQUE = 40;

/* Gymnasium's ContactDetector: the lander's body touching anything ends the game; a leg's contact with the
 * ground comes and goes. */
struct Contacts : b2ContactListener {
    b2Body *lander = nullptr, *legs[2] = { nullptr, nullptr };
    bool crashed = false, leg_contact[2] = { false, false };
    void touch(b2Contact *c, bool begin) {
        b2Body *a = c->GetFixtureA()->GetBody(), *b = c->GetFixtureB()->GetBody();
        if (begin && (a == lander || b == lander)) crashed = true;
        for (int i = 0; i < 2; i++)
            if (a == legs[i] || b == legs[i]) leg_contact[i] = begin;
    }
    void BeginContact(b2Contact *c) override { touch(c, true); }
    void EndContact(b2Contact *c) override { touch(c, false); }
};

} // namespace

struct dt_lunar_world {
    b2World *world;
    Contacts contacts;
};

extern "C" dt_status dt_lunar_world_create(dt_lunar_world **out) {
    *out = new (std::nothrow) dt_lunar_world();
    if (!*out) return dt_error(DT_ERR_NOMEM, "LunarLander: out of memory for its world");
    return DT_OK;
}

extern "C" void dt_lunar_world_destroy(dt_lunar_world *w) {
    if (!w) return;
    delete w->world;
    delete w;
}

static b2Body *lander_body(b2World *world, double x, double y) {
    b2BodyDef bd;
    bd.type = b2_dynamicBody;
    bd.position.Set((float)x, (float)y);
    b2Body *body = world->CreateBody(&bd);
    b2Vec2 v[6];
    for (int i = 0; i < 6; i++) v[i].Set((float)(LANDER_POLY[i][0] / SCALE), (float)(LANDER_POLY[i][1] / SCALE));
    b2PolygonShape shape;
    shape.Set(v, 6);
    b2FixtureDef fd;
    fd.shape = &shape;
    fd.density = 5.0f;
    fd.friction = 0.1f;
    fd.filter.categoryBits = 0x0010;
    fd.filter.maskBits = 0x001; /* the ground only */
    fd.restitution = 0.0f;
    body->CreateFixture(&fd);
    return body;
}

/* Leg i (side -1 or +1) hangs from the lander on a motorised joint whose limits let it swing half a radian. */
static b2Body *leg_body(b2World *world, b2Body *lander, int side, double x, double y) {
    b2BodyDef bd;
    bd.type = b2_dynamicBody;
    bd.position.Set((float)(x - side * LEG_AWAY / SCALE), (float)y);
    bd.angle = (float)(side * 0.05);
    b2Body *leg = world->CreateBody(&bd);
    b2PolygonShape shape;
    shape.SetAsBox((float)(LEG_W / SCALE), (float)(LEG_H / SCALE));
    b2FixtureDef fd;
    fd.shape = &shape;
    fd.density = 1.0f;
    fd.restitution = 0.0f;
    fd.filter.categoryBits = 0x0020;
    fd.filter.maskBits = 0x001;
    leg->CreateFixture(&fd);
    b2RevoluteJointDef rjd;
    rjd.bodyA = lander;
    rjd.bodyB = leg;
    rjd.localAnchorA.Set(0, 0);
    rjd.localAnchorB.Set((float)(side * LEG_AWAY / SCALE), (float)(DT_LUNAR_LEG_DOWN / SCALE));
    rjd.enableMotor = true;
    rjd.enableLimit = true;
    rjd.maxMotorTorque = (float)LEG_SPRING_TORQUE;
    rjd.motorSpeed = (float)(0.3 * side); /* low enough not to jump back into the sky */
    rjd.lowerAngle = (float)(side < 0 ? 0.9 - 0.5 : -0.9);
    rjd.upperAngle = (float)(side < 0 ? 0.9 : -0.9 + 0.5);
    world->CreateJoint(&rjd);
    return leg;
}

extern "C" void dt_lunar_world_reset(dt_lunar_world *w, const double *chunk_x, const double *smooth_y, double fx, double fy) {
    const double W = DT_LUNAR_VIEW_W / SCALE, H = DT_LUNAR_VIEW_H / SCALE;
    delete w->world;
    w->world = new b2World(b2Vec2(0.0f, -10.0f));
    w->contacts = Contacts();
    w->world->SetContactListener(&w->contacts);
    b2BodyDef moon_def;
    b2Body *moon = w->world->CreateBody(&moon_def);
    b2EdgeShape edge;
    edge.SetTwoSided(b2Vec2(0, 0), b2Vec2((float)W, 0));
    moon->CreateFixture(&edge, 0.0f);
    for (int i = 0; i < DT_LUNAR_CHUNKS - 1; i++) {
        edge.SetTwoSided(b2Vec2((float)chunk_x[i], (float)smooth_y[i]), b2Vec2((float)chunk_x[i + 1], (float)smooth_y[i + 1]));
        b2FixtureDef fd;
        fd.shape = &edge;
        fd.density = 0.0f;
        fd.friction = 0.1f;
        moon->CreateFixture(&fd);
    }
    const double x = W / 2, y = H;
    b2Body *lander = lander_body(w->world, x, y);
    lander->ApplyForceToCenter(b2Vec2((float)fx, (float)fy), true);
    w->contacts.lander = lander;
    for (int i = 0; i < 2; i++) w->contacts.legs[i] = leg_body(w->world, lander, i ? +1 : -1, x, y);
}

extern "C" void dt_lunar_world_impulse(dt_lunar_world *w, double ix, double iy, double px, double py) {
    w->contacts.lander->ApplyLinearImpulse(b2Vec2((float)ix, (float)iy), b2Vec2((float)px, (float)py), true);
}

extern "C" void dt_lunar_world_step(dt_lunar_world *w) { w->world->Step(1.0f / DT_LUNAR_FPS, 6 * 30, 2 * 30); }

extern "C" void dt_lunar_world_read(const dt_lunar_world *w, dt_lunar_state *s) {
    const b2Body *b = w->contacts.lander;
    b2Vec2 p = b->GetPosition(), v = b->GetLinearVelocity();
    s->x = p.x, s->y = p.y, s->vx = v.x, s->vy = v.y;
    s->angle = b->GetAngle();
    s->omega = b->GetAngularVelocity();
    s->awake = b->IsAwake();
    s->crashed = w->contacts.crashed;
    for (int i = 0; i < 2; i++) s->leg_contact[i] = w->contacts.leg_contact[i];
}

extern "C" void dt_lunar_world_outline(const dt_lunar_world *w, float *xy) {
    const b2Body *bodies[3] = { w->contacts.lander, w->contacts.legs[0], w->contacts.legs[1] };
    int k = 0;
    for (const b2Body *b : bodies) {
        const b2PolygonShape *poly = static_cast<const b2PolygonShape *>(b->GetFixtureList()->GetShape());
        for (int i = 0; i < poly->m_count; i++) {
            b2Vec2 p = b->GetWorldPoint(poly->m_vertices[i]);
            xy[k++] = p.x, xy[k++] = p.y;
        }
    }
}
