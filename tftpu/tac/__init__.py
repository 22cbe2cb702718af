"""tftpu.tac"""
