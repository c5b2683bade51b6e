"""gateway.naming: the cross-protocol conventions every door and Spark share."""

from gateway.naming import (
    MQTT_OTHER_TOPIC,
    P_MQTT_TOPIC,
    mqtt_topic_of_routing_key,
    routing_key_of_mqtt_topic,
    unified_topic_of_mqtt,
)


def test_mqtt_topic_lives_in_its_first_level():
    assert unified_topic_of_mqtt("a/b/c") == "a"
    assert unified_topic_of_mqtt("a") == "a"
    assert unified_topic_of_mqtt("$SYS/broker") == "$SYS"


def test_first_levels_that_cannot_be_topics_share_one():
    for t in ("/a/b", "%SYS/x", "x" * 256 + "/y", "a\x01b/c", ""):
        assert unified_topic_of_mqtt(t) == MQTT_OTHER_TOPIC


def test_routing_key_and_mqtt_topic_swap_dot_and_slash():
    assert mqtt_topic_of_routing_key("a.b.c") == "a/b/c"
    assert mqtt_topic_of_routing_key("a/b.c") == "a.b/c"
    for t in ("a/b/c", "x.y/z", "", "/"):
        assert mqtt_topic_of_routing_key(routing_key_of_mqtt_topic(t)) == t


def test_property_name_is_what_the_doors_write():
    from adapters.mqtt.broker import message_properties

    assert message_properties("a/b", 1, False, None)[P_MQTT_TOPIC] == "a/b"
